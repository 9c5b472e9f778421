// The Function App's roles on one resource group whose VMs it manages (lb-pools, and the
// approval gate's acknowledge fallback). Deployed once per group (main.bicep loops with
// scope: resourceGroup(name)), so these grants reach that group and nothing else.

@description('Principal id of the Function App identity.')
param functionAppPrincipalId string

// Network Contributor
var networkContributor = '4d97b98b-1d4f-4787-a291-c67834d212e7'
// Scheduled Events Contributor
var scheduledEventsContributor = 'b67fe603-310e-4889-b9ee-8257d09d353d'

// Network Contributor: remove/restore NIC ip configurations in backend pools, tag the NIC.
resource appManagesPools 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(resourceGroup().id, functionAppPrincipalId, networkContributor)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', networkContributor)
    principalId: functionAppPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// Scheduled Events Contributor: read VMs (to find their NICs) and acknowledge their scheduled
// events through ARM when a forwarder is silent. The narrowest built-in role with either
// right: VM, scale set and availability set reads plus the acknowledge action, nothing else.
resource appReadsVmsAndAcknowledges 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(resourceGroup().id, functionAppPrincipalId, scheduledEventsContributor)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', scheduledEventsContributor)
    principalId: functionAppPrincipalId
    principalType: 'ServicePrincipal'
  }
}
