// The Function App's roles on one resource group whose VMs it manages (lb-pools, and the
// approval gate's acknowledge fallback). Deployed once per group (main.bicep loops with
// scope: resourceGroup(name)), so these grants reach that group and nothing else.
//
// The ARM calls the app makes (functions/adapters/arm.py) and which role covers each:
//   GET  Microsoft.Compute/virtualMachines/{vm}                       Scheduled Events Contributor
//   GET  Microsoft.Network/networkInterfaces/{nic}                    Network Contributor
//   PUT  Microsoft.Network/networkInterfaces/{nic}                    Network Contributor
//   GET  Microsoft.Network/loadBalancers/{lb}                         Network Contributor
//   POST Microsoft.Network/loadBalancers/{lb}/loadBalancingRules/{rule}/health
//                                                                     Network Contributor
//   POST {vm}/providers/Microsoft.Maintenance/scheduledevents/{id}/acknowledge
//                                                                     Scheduled Events Contributor
//   GET  Microsoft.Compute/virtualMachineScaleSets/{ss}/virtualMachines/{id} (and its NICs)
//                                                                     Scale-set instance reader
// The last is a Uniform scale-set instance: the scope check reads it to verify a forwarder that
// runs on one (and its scale set's other instances it names). No built-in role narrower than
// Reader has that read, so a custom role with exactly the two reads is defined in this group.

@description('Principal id of the Function App identity.')
param functionAppPrincipalId string

// Network Contributor
var networkContributor = '4d97b98b-1d4f-4787-a291-c67834d212e7'
// Scheduled Events Contributor
var scheduledEventsContributor = 'b67fe603-310e-4889-b9ee-8257d09d353d'
// Scale-set instance reader (custom)
var scaleSetInstanceReader = guid(resourceGroup().id, 'sebridge-scale-set-instance-reader')

// Network Contributor: lb-pools and the approval gate GET NICs (networkInterfaces/read); lb-pools
// PUTs them (networkInterfaces/write) to take ip configurations out of backend pools and put them
// back, with the record in the NIC's tags. ARM checks the PUT against what the NIC links to:
// restoring needs loadBalancers/backendAddressPools/join/action on the pool, and the subnet's
// virtualNetworks/subnets/join/action may be checked too. This role grants both for load
// balancers and virtual networks in this group only (docs/deploy.md). No Microsoft.Compute
// action.
resource appManagesPools 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(resourceGroup().id, functionAppPrincipalId, networkContributor)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', networkContributor)
    principalId: functionAppPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// Scheduled Events Contributor: its actions are Microsoft.Compute/virtualMachines/read,
// virtualMachineScaleSets/read, availabilitySets/read and
// Microsoft.Maintenance/scheduledevents/acknowledge/action. The app uses virtualMachines/read
// (lb-pools and the gate GET a VM to find its NICs) and, only with acknowledgeFallbackEnabled,
// the acknowledge action; it never reads scale sets or availability sets. Granted whether or not
// the fallback is on, because the VM reads need it and we know of no narrower built-in role
// with virtualMachines/read (Reader reads everything in the group; Virtual Machine User Login
// adds signing in to the VMs). It does not include virtualMachineScaleSets/virtualMachines/read
// (Uniform instances).
resource appReadsVmsAndAcknowledges 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(resourceGroup().id, functionAppPrincipalId, scheduledEventsContributor)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', scheduledEventsContributor)
    principalId: functionAppPrincipalId
    principalType: 'ServicePrincipal'
  }
}

// The custom role: the two reads of a Uniform scale-set instance, assignable in this group only.
// Role names are unique per tenant, hence the group's hash in it.
resource scaleSetInstanceReaderRole 'Microsoft.Authorization/roleDefinitions@2022-04-01' = {
  name: scaleSetInstanceReader
  properties: {
    roleName: 'Scheduled Events Bridge scale-set instance reader ${uniqueString(resourceGroup().id)}'
    description: 'Read Uniform scale-set instances and their network interfaces (the Scheduled Events Bridge verifies forwarders that run on them).'
    type: 'CustomRole'
    permissions: [
      {
        actions: [
          'Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read'
          'Microsoft.Compute/virtualMachineScaleSets/virtualMachines/networkInterfaces/read'
        ]
        notActions: []
        dataActions: []
        notDataActions: []
      }
    ]
    assignableScopes: [
      resourceGroup().id
    ]
  }
}

// Scale-set instance reader (custom): the scope check and lb-pools read a Uniform instance
// (virtualMachineScaleSets/virtualMachines/read) and its NICs (.../networkInterfaces/read) to
// verify a forwarder on it and the instances it names. Reads only; the instances' pools stay
// the scale-set model's (lb-pools never writes them).
resource appReadsScaleSetInstances 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(resourceGroup().id, functionAppPrincipalId, scaleSetInstanceReader)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', scaleSetInstanceReader)
    principalId: functionAppPrincipalId
    principalType: 'ServicePrincipal'
  }
  dependsOn: [
    scaleSetInstanceReaderRole
  ]
}
