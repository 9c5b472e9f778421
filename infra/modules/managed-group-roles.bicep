// Network Contributor on one resource group the lb-pools workflow manages load balancer pools in.
// Deployed once per group (main.bicep loops with scope: resourceGroup(name)), so the Function
// App can change NIC ip configurations there and nowhere else.

@description('Principal id of the Function App identity.')
param functionAppPrincipalId string

// Network Contributor
var networkContributor = '4d97b98b-1d4f-4787-a291-c67834d212e7'

// Network Contributor: remove/restore NIC ip configurations in backend pools, tag the NIC.
resource appManagesPools 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(resourceGroup().id, functionAppPrincipalId, networkContributor)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', networkContributor)
    principalId: functionAppPrincipalId
    principalType: 'ServicePrincipal'
  }
}
